module kwire.lab/drivers/labdriver

go 1.21
